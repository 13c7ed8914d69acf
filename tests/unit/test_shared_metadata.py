"""Cluster metadata shared by brokers (coordinator.metadata over a shared log): a write
goes in only where the log still ends, a refused one is undone, the log caught up and
the operation run again on the new state, boundedly; `catch_up` tells what another
broker changed. The database is a list of batches here (`Database`), the brokers two
or three `MetadataStore`s with data dirs of their own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.metadata import (
    MAX_CONFLICT_RETRIES,
    BrokerConfigsChange,
    MetadataChange,
    MetadataStore,
    TopicChange,
    _compaction_keys,
    topic_record,
)
from persister.clock import ManualClock
from persister.commit import GroupCommit
from persister.file_log import LogConfig, PartitionLog
from persister.storage import LogConflict
from protocol.errors import ErrorCode, KafkaError


class Database:
    """The shared copy: the batches every store committed, in offset order."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int, bytes]] = []
        self.commits = 0
        self.refused = 0

    @property
    def end(self) -> int:
        return self.batches[-1][1] + 1 if self.batches else 0


class SharedLog(PartitionLog):
    """A `PartitionLog` committed to a `Database` by expected end offset, as
    persister.pg_storage's PgSharedLog commits to PostgreSQL."""

    db: Database
    pending: list[tuple[int, int, bytes]]
    # Run before each commit's check: another broker appending first.
    interfere: Callable[[], Any] | None

    def append(self, data: bytearray | memoryview, now_ms: int) -> Any:
        result = super().append(data, now_ms)
        self.pending.append((result.first_offset, result.last_offset, bytes(data)))
        return result

    def truncate_to(self, offset: int) -> int:
        removed = super().truncate_to(offset)
        self.pending = [b for b in self.pending if b[0] < offset]
        return removed

    async def flush_async(self) -> None:
        batches, self.pending = self.pending, []
        await asyncio.sleep(0)  # the round trip: other stores' writes go on meanwhile
        if not batches:
            return
        if self.interfere is not None:
            await self.interfere()
        if self.db.end != batches[0][0]:
            self.db.refused += 1
            raise LogConflict("meta", batches[0][0])
        self.db.batches.extend(batches)
        self.db.commits += 1

    async def catch_up(self) -> int:
        start = self.log_end_offset
        await asyncio.sleep(0)
        for base, _, data in self.db.batches:
            if base >= self.log_end_offset:
                PartitionLog.append_raw(self, bytearray(data), 0)
        return start


class Storage:
    """The one call of a storage engine MetadataStore makes: `open_log`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def open_log(self, directory: Path, config: LogConfig, now_ms: int) -> PartitionLog:
        plog = SharedLog.open(directory, config, now_ms)
        assert isinstance(plog, SharedLog)
        plog.db, plog.pending, plog.interfere = self.db, [], None
        return plog


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    group = GroupCommit()
    group.start()
    yield group
    await group.stop()


@pytest.fixture
def db() -> Database:
    return Database()


@pytest.fixture
def brokers(tmp_path: Path, commit: GroupCommit, db: Database) -> Callable[[str], MetadataStore]:
    def make(name: str) -> MetadataStore:
        store = MetadataStore(
            tmp_path / name / "meta",
            commit,
            clock=ManualClock(),
            storage=Storage(db),  # type: ignore[arg-type]
        )
        assert store.shared is not None
        return store

    return make


def shared_log(store: MetadataStore) -> SharedLog:
    plog = store.runtime.record_log.partition_log
    assert isinstance(plog, SharedLog)
    return plog


async def create(store: MetadataStore, name: str, partitions: int = 1) -> uuid.UUID:
    """CreateTopics of one topic as the handler runs it: checked in the op."""

    def op() -> tuple[list[dict[str, Any]], uuid.UUID]:
        topic, record = store.state.new_topic_record(name, partitions, {}, uuid.uuid4())
        return [record], topic.topic_id

    return await store.run(op)


async def test_a_topic_created_elsewhere_while_a_creation_runs_is_refused_after_a_catch_up(
    brokers: Callable[[str], MetadataStore], db: Database
) -> None:
    a, b = brokers("a"), brokers("b")
    created: list[uuid.UUID] = []

    async def a_first() -> None:
        shared_log(b).interfere = None
        created.append(await create(a, "orders", 3))

    # a creates the topic after b's op checked it was absent, before b's write lands:
    # b's write is refused, b catches up and its op runs again.
    shared_log(b).interfere = a_first
    with pytest.raises(KafkaError) as refused:
        await create(b, "orders")
    assert refused.value.code == ErrorCode.topic_already_exists
    assert b.conflicts == 1
    assert b.state.topics["orders"].topic_id == created[0]
    assert b.state.topics["orders"].partitions == 3
    assert b.runtime.record_log.end_offset == a.runtime.record_log.end_offset == db.end
    # b's copy is the database's: a later write of b goes in first time.
    other = await create(b, "payments")
    assert b.conflicts == 1
    await a.catch_up()
    assert a.state.topics["payments"].topic_id == other


async def test_an_operation_sees_what_other_brokers_committed_before_it_began(
    brokers: Callable[[str], MetadataStore],
) -> None:
    """A check that writes nothing when it fails (does the topic exist?) still sees a
    topic another broker created a moment ago: the store catches up first."""
    a, b = brokers("a"), brokers("b")
    await create(a, "orders")

    def alter() -> tuple[list[dict[str, Any]], dict[str, str]]:
        topic, record = b.state.topic_configs_record("orders", lambda c: {"retention.ms": "1"})
        return ([] if record is None else [record]), topic.configs

    assert await b.run(alter) == {"retention.ms": "1"}
    assert b.conflicts == 0
    with pytest.raises(KafkaError) as exists:
        await create(b, "orders")
    assert exists.value.code == ErrorCode.topic_already_exists
    assert b.conflicts == 0


async def test_concurrent_creations_of_one_name_on_three_brokers_make_one_topic(
    brokers: Callable[[str], MetadataStore], db: Database
) -> None:
    stores = [brokers(n) for n in "abc"]
    for round_ in range(20):
        name = f"t{round_}"
        results = await asyncio.gather(
            *(create(s, name) for s in stores for _ in range(2)), return_exceptions=True
        )
        ids = [r for r in results if isinstance(r, uuid.UUID)]
        errors = [r for r in results if not isinstance(r, uuid.UUID)]
        assert len(ids) == 1, results
        assert all(
            isinstance(e, KafkaError) and e.code == ErrorCode.topic_already_exists for e in errors
        ), errors
        for s in stores:
            await s.catch_up()
            assert s.state.topics[name].topic_id == ids[0]
    assert db.refused > 0
    assert sum(1 for _ in db.batches) == len(set(base for base, _, _ in db.batches))


async def test_one_cluster_id_when_brokers_start_at_once(
    brokers: Callable[[str], MetadataStore], db: Database
) -> None:
    stores = [brokers(n) for n in "abc"]
    ids = await asyncio.gather(*(s.ensure_cluster_id() for s in stores))
    assert len(set(ids)) == 1
    assert db.commits == 1
    # A broker started later reads it and writes nothing.
    late = brokers("d")
    assert await late.ensure_cluster_id() == ids[0]
    assert db.commits == 1


async def test_producer_ids_are_unique_across_brokers(
    brokers: Callable[[str], MetadataStore],
) -> None:
    a, b = brokers("a"), brokers("b")
    got: list[int] = []
    for _ in range(1500):
        got.extend(await asyncio.gather(a.allocate_producer_id(), b.allocate_producer_id()))
    assert len(set(got)) == len(got) == 3000
    # A broker that starts later takes a block past all of them.
    c = brokers("c")
    assert await c.allocate_producer_id() > max(got)


async def test_a_write_refused_every_time_fails_with_not_controller_after_the_retries(
    brokers: Callable[[str], MetadataStore], db: Database
) -> None:
    a, other = brokers("a"), brokers("other")
    writes = 0

    async def append_first() -> None:
        nonlocal writes
        writes += 1
        await other.run(lambda: ([{"type": "broker_config", "configs": {"n": str(writes)}}], None))

    shared_log(a).interfere = append_first
    with pytest.raises(KafkaError) as failed:
        await create(a, "orders")
    assert failed.value.code == ErrorCode.not_controller
    assert a.conflicts == MAX_CONFLICT_RETRIES + 1
    assert "orders" not in a.state.topics
    # Nothing of a's is in the log, and a's copy is still the database's.
    shared_log(a).interfere = None
    await a.catch_up()
    assert a.runtime.record_log.end_offset == db.end
    assert a.state.broker_configs == {"n": str(writes)}
    await create(a, "orders")
    await other.catch_up()
    assert "orders" in other.state.topics


async def test_catch_up_tells_what_another_broker_changed(
    brokers: Callable[[str], MetadataStore],
) -> None:
    a, b = brokers("a"), brokers("b")
    seen: list[MetadataChange] = []
    b.on_replayed = seen.extend
    await create(a, "orders", 1)
    await b.catch_up()
    created = b.state.topics["orders"]
    assert seen == [TopicChange("orders", None, created)]

    seen.clear()
    grow = a.state.grow_topic_record("orders", 3, None)[2]
    await a.run(lambda: ([grow], None))
    configs = a.state.topic_configs_record("orders", lambda c: {**c, "retention.ms": "1000"})[1]
    assert configs is not None
    await a.run(lambda: ([configs], None))
    await a.run(lambda: ([{"type": "broker_config", "configs": {"num.partitions": "4"}}], None))
    await a.allocate_producer_id()  # nothing to act on
    await b.catch_up()
    grown, reconfigured = seen[0], seen[1]
    assert isinstance(grown, TopicChange) and isinstance(reconfigured, TopicChange)
    assert (grown.before, grown.after and grown.after.partitions) == (created, 3)
    assert reconfigured.after is not None
    assert reconfigured.after.configs == {"retention.ms": "1000"}
    assert seen[2] == BrokerConfigsChange({"num.partitions": "4"})
    assert len(seen) == 3

    seen.clear()
    topic = a.state.topics["orders"]
    await a.run(lambda: ([a.state.delete_topic_record(topic)], None))
    again = topic_record(type(topic)("orders", uuid.uuid4(), 1))
    await a.run(lambda: ([again], None))
    await b.catch_up()
    deleted, recreated = seen
    assert isinstance(deleted, TopicChange) and isinstance(recreated, TopicChange)
    assert deleted.after is None and deleted.before is not None
    assert deleted.before.topic_id == topic.topic_id
    assert recreated.before is None and recreated.after == b.state.topics["orders"]
    # Nothing new: nothing told.
    seen.clear()
    assert await b.catch_up() == 0
    assert seen == []


async def test_a_restarted_broker_reads_its_copy_and_follows(
    brokers: Callable[[str], MetadataStore], db: Database
) -> None:
    a, b = brokers("a"), brokers("b")
    await create(a, "orders")
    await b.catch_up()
    b.close()
    await create(a, "payments")
    b = brokers("b")
    assert set(b.state.topics) == {"orders"}  # its data dir's copy
    await b.catch_up()
    assert set(b.state.topics) == {"orders", "payments"}
    assert b.runtime.record_log.end_offset == db.end


async def test_broker_configs_are_the_clusters_and_each_brokers_own(
    brokers: Callable[[str], MetadataStore],
) -> None:
    """IncrementalAlterConfigs of BROKER "" sets the cluster-wide defaults, of BROKER
    "<id>" that broker's own: kept apart, each replaced whole by its next record, and
    each kept by compaction (its own key)."""
    a, b = brokers("a"), brokers("b")

    async def set_(store: MetadataStore, node: str | None, key: str, value: str) -> None:
        def op() -> tuple[list[dict[str, Any]], None]:
            _, record = store.state.broker_configs_record(lambda c: {**c, key: value}, node)
            return [record], None

        await store.run(op)

    seen: list[MetadataChange] = []
    b.on_replayed = seen.extend
    await set_(a, None, "num.partitions", "4")
    await set_(a, "1", "num.partitions", "6")
    await set_(b, "2", "log.retention.ms", "1000")
    await set_(a, "1", "log.retention.ms", "2000")
    for store in (a, b):
        await store.catch_up()
        assert store.state.broker_configs == {"num.partitions": "4"}
        assert store.state.node_broker_configs == {
            "1": {"num.partitions": "6", "log.retention.ms": "2000"},
            "2": {"log.retention.ms": "1000"},
        }
    assert seen[-1] == BrokerConfigsChange({"num.partitions": "6", "log.retention.ms": "2000"}, "1")
    record_log = a.runtime.record_log
    keys = {k for key, value in record_log.replay() for k, _ in _compaction_keys(key, value)}
    assert {("broker_config",), ("broker_config", "1"), ("broker_config", "2")} <= keys
