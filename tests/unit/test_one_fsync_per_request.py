"""One append and one fsync per request: `CoordinatorRuntime.run_many` and the share
coordinator's `write_states` (WriteShareGroupState over many partitions, a ShareFetch
acquiring on many partitions).

The disk is the one of test_runtime: it fails the next append or fsync on demand, and
counts fsync rounds; `GroupCommit.rounds` counts the rounds the group commit ran.
"""

from __future__ import annotations

import errno
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.share_persister import DurablePersister, StateWrite, write_states
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.clock import ManualClock
from persister.commit import GroupCommit
from persister.coordinator_log import KeyValue
from protocol.errors import ErrorCode, KafkaError
from tests.unit import test_runtime
from tests.unit.test_runtime import ERRNOS, STAGES, Disk, Row, TableStore, reopen

# The disk, group commit, clock and table of test_runtime's tests.
clock = test_runtime.clock
commit = test_runtime.commit
disk = test_runtime.disk
open_table = test_runtime.open_table

TOPIC = uuid.UUID(int=7)


def count_appends(store: TableStore) -> list[int]:
    """Records per append of the store's log, as they happen."""
    appends: list[int] = []
    write = store.log.write

    def counted(records: list[KeyValue]) -> int:
        appends.append(len(records))
        return write(records)

    store.log.write = counted  # type: ignore[method-assign,assignment]
    return appends


def setter(key: str, value: str) -> tuple[str, Callable[[], tuple[list[Row], None]]]:
    return key, lambda: ([(key, value)], None)


async def test_operations_on_many_keys_are_one_append_and_one_fsync_round(
    open_table: Callable[..., TableStore], disk: Disk, commit: GroupCommit
) -> None:
    store = open_table()
    appends = count_appends(store)
    rounds, flushes = commit.rounds, disk.flushes
    results = await store.runtime.run_many([setter(f"k{i}", str(i)) for i in range(50)])
    assert results == [None] * 50
    assert appends == [50]
    assert commit.rounds - rounds == 1
    assert disk.flushes - flushes == 1
    assert store.table.values == {f"k{i}": str(i) for i in range(50)}
    assert store.runtime.keys_in_use == 0
    assert reopen(store, open_table).table.values == {f"k{i}": str(i) for i in range(50)}


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("stage", STAGES)
async def test_a_failed_shared_write_fails_every_key_and_applies_none(
    open_table: Callable[..., TableStore], disk: Disk, stage: str, code: int
) -> None:
    store = open_table()
    await store.set("k0", "old")
    end = store.log.end_offset
    disk.fail(stage, code)
    results = await store.runtime.run_many([setter(f"k{i}", "new") for i in range(10)])
    assert all(isinstance(r, KafkaError) for r in results)
    assert {r.code for r in results if isinstance(r, KafkaError)} == {ErrorCode.kafka_storage_error}
    assert store.table.values == {"k0": "old"}
    assert store.log.end_offset == end
    assert store.runtime.keys_in_use == 0
    # The disk is back: the same request succeeds, and a restart replays exactly that.
    assert await store.runtime.run_many([setter(f"k{i}", "new") for i in range(10)]) == [None] * 10
    assert reopen(store, open_table).table.values == {f"k{i}": "new" for i in range(10)}


async def test_an_operation_refused_fails_alone_and_the_others_are_written(
    open_table: Callable[..., TableStore], disk: Disk, commit: GroupCommit
) -> None:
    store = open_table()

    def refuse() -> tuple[list[Row], None]:
        raise KafkaError(ErrorCode.invalid_request, "bad batch")

    rounds = commit.rounds
    results = await store.runtime.run_many([setter("a", "1"), ("b", refuse), setter("c", "3")])
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], KafkaError) and results[1].code == ErrorCode.invalid_request
    assert store.table.values == {"a": "1", "c": "3"}
    assert commit.rounds - rounds == 1


async def test_a_key_named_twice_sees_the_first_write_applied(
    open_table: Callable[..., TableStore], disk: Disk
) -> None:
    store = open_table()
    seen: list[str | None] = []

    def append_x() -> tuple[list[Row], None]:
        value = store.table.values.get("a")
        seen.append(value)
        return [("a", (value or "") + "x")], None

    await store.runtime.run_many([("a", append_x), setter("b", "1"), ("a", append_x)])
    assert seen == [None, "x"]
    assert store.table.values == {"a": "xx", "b": "1"}


async def test_nothing_to_write_takes_no_fsync_round(
    open_table: Callable[..., TableStore], commit: GroupCommit
) -> None:
    store = open_table()
    rounds = commit.rounds
    assert await store.runtime.run_many([("a", lambda: ([], "read"))]) == ["read"]
    assert commit.rounds == rounds


# ------------------------------------------------------------------ the share coordinator


def _open(tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk) -> DurablePersister:
    persister = DurablePersister(tmp_path / "share-state", commit, clock=clock)
    disk.attach(persister.records)
    persister.load()
    return persister


def _writes(partitions: int, offset: int) -> list[StateWrite]:
    return [
        StateWrite(
            ShareStateKey("g", TOPIC, p), 0, 0, offset, [PersistedBatch(offset, offset, 2, 1)]
        )
        for p in range(partitions)
    ]


async def test_write_states_of_500_partitions_share_one_fsync_round(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk
) -> None:
    persister = _open(tmp_path, commit, clock, disk)
    for p in range(500):
        await persister.initialize_state(ShareStateKey("g", TOPIC, p), 0, 0)
    rounds = commit.rounds
    assert await write_states(persister, _writes(500, 3)) == [None] * 500
    assert commit.rounds - rounds == 1
    for p in range(500):
        state = persister.shard.state(ShareStateKey("g", TOPIC, p))
        assert state is not None and state.start_offset == 3
    persister.close()


@pytest.mark.parametrize("stage", STAGES)
async def test_a_failed_write_states_rolls_back_every_partition(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk, stage: str
) -> None:
    persister = _open(tmp_path, commit, clock, disk)
    keys = [ShareStateKey("g", TOPIC, p) for p in range(20)]
    for key in keys:
        await persister.initialize_state(key, 0, 0)
    await write_states(persister, _writes(20, 1))
    before = {key: persister.shard.state(key) for key in keys}
    disk.fail(stage, errno.EIO)
    results = await write_states(persister, _writes(20, 2))
    assert [getattr(r, "code", None) for r in results] == [ErrorCode.kafka_storage_error] * 20
    assert {key: persister.shard.state(key) for key in keys} == before
    persister.close()
    restarted = _open(tmp_path, commit, clock, disk)
    assert {key: restarted.shard.state(key) for key in keys} == before
    restarted.close()


async def test_write_states_fails_a_fenced_partition_alone(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk
) -> None:
    persister = _open(tmp_path, commit, clock, disk)
    old, new = ShareStateKey("g", TOPIC, 0), ShareStateKey("g", TOPIC, 1)
    await persister.initialize_state(old, 5, 0)
    await persister.initialize_state(new, 0, 0)
    results = await write_states(
        persister,
        [
            StateWrite(old, 4, 0, 1, [PersistedBatch(1, 1, 2, 1)]),
            StateWrite(new, 0, 0, 1, [PersistedBatch(1, 1, 2, 1)]),
        ],
    )
    assert isinstance(results[0], KafkaError)
    assert results[0].code == ErrorCode.fenced_state_epoch
    assert results[1] is None
    assert persister.shard.state(old).start_offset == 0  # type: ignore[union-attr]
    assert persister.shard.state(new).start_offset == 1  # type: ignore[union-attr]
    persister.close()
