"""A coordinator whose log another broker claimed: the write the storage refused
(`persister.storage.Fenced`) is answered NOT_COORDINATOR, not KAFKA_STORAGE_ERROR, and
nothing of it is applied."""

from __future__ import annotations

import uuid

import pytest

from coordinator.runtime import CoordinatorRuntime
from coordinator.share_persister import InMemoryPersister
from coordinator.share_state import ShareStateKey
from persister.clock import ManualClock
from persister.coordinator_log import KeyValue, MemoryRecordLog
from persister.storage import Fenced
from protocol.errors import ErrorCode, KafkaError


class ClaimedLog(MemoryRecordLog):
    """Records in memory; once `claimed`, every sync is refused as a fenced commit is."""

    claimed = False

    async def sync(self) -> None:
        if self.claimed:
            raise Fenced("groups", 3)


async def test_a_refused_write_answers_not_coordinator_and_applies_nothing() -> None:
    applied: list[KeyValue] = []
    record_log = ClaimedLog()
    runtime: CoordinatorRuntime[KeyValue] = CoordinatorRuntime(
        "groups",
        record_log,
        encode=lambda kv: [kv],
        decode=lambda k, v: (k, v),
        replay=applied.append,
        clock=ManualClock(),
    )
    runtime.load()
    await runtime.run("k", lambda: ([(b"k", b"1")], None))
    record_log.claimed = True
    with pytest.raises(KafkaError) as refused:
        await runtime.run("k", lambda: ([(b"k", b"2")], None))
    assert refused.value.code == ErrorCode.not_coordinator
    assert applied == [(b"k", b"1")]
    assert record_log.records == [(b"k", b"1")]  # the refused write was undone
    runtime.close()


async def test_once_fenced_every_operation_answers_not_coordinator_without_writing() -> None:
    record_log = ClaimedLog()
    told: list[str] = []
    runtime: CoordinatorRuntime[KeyValue] = CoordinatorRuntime(
        "share-state",
        record_log,
        encode=lambda kv: [kv],
        decode=lambda k, v: (k, v),
        replay=lambda _kv: None,
        clock=ManualClock(),
    )
    runtime.on_fenced = lambda: told.append("unload")
    runtime.load()
    record_log.claimed = True
    with pytest.raises(KafkaError):
        await runtime.run("k", lambda: ([(b"k", b"1")], None))
    assert runtime.fenced is not None and told == ["unload"]
    ran: list[str] = []

    def op() -> tuple[list[KeyValue], None]:
        ran.append("op")
        return [(b"k", b"2")], None

    with pytest.raises(KafkaError) as refused:
        await runtime.run("k", op)
    assert refused.value.code == ErrorCode.not_coordinator
    results = await runtime.run_many([("a", op), ("b", op)])
    assert all(isinstance(r, KafkaError) and r.code == ErrorCode.not_coordinator for r in results)
    assert ran == [] and record_log.records == []
    assert told == ["unload"]  # told once
    runtime.close()


async def test_a_fenced_share_persister_refuses_reads_as_a_moved_coordinator() -> None:
    record_log = ClaimedLog()
    persister = InMemoryPersister(record_log=record_log, clock=ManualClock())
    persister.load()
    key = ShareStateKey("g", uuid.UUID(int=1), 0)
    await persister.initialize_state(key, 0, 0)
    told: list[str] = []
    persister.runtime.on_fenced = lambda: told.append("drop share partitions")
    record_log.claimed = True
    with pytest.raises(KafkaError) as refused:
        await persister.write_state(key, 0, 0, 0, [])
    assert refused.value.code == ErrorCode.not_coordinator
    assert told == ["drop share partitions"]
    for read in (persister.read_state(key, 0), persister.read_summary(key)):
        with pytest.raises(KafkaError) as moved:
            await read
        assert moved.value.code == ErrorCode.not_coordinator
    persister.close()
