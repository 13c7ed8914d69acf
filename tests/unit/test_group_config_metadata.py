"""Group configs in the cluster metadata log (coordinator.metadata): `group_config`
records, one per (group, key), altered by one metadata operation with today's checks,
replayed by every broker of a shared log, compacted per key, and the configs a groups
log held before adopted once with the metadata winning. The spark audit reads them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from coordinator import group_records
from coordinator.group_config import (
    DELETE,
    GROUP_CONFIG_SOURCE,
    SET,
    AlterConfigOp,
    GroupConfigRecord,
    GroupConfigStore,
    ShareGroupBrokerConfig,
)
from coordinator.metadata import ClusterState, MetadataStore, _compaction_keys, _encode
from persister.commit import GroupCommit
from persister.spark.audit import GROUP_LIMIT_KEY, build_context
from protocol.errors import ErrorCode, KafkaError
from tests.unit import test_shared_metadata as shared

# The shared-log fixtures: brokers as MetadataStores over one `Database`.
db = shared.db
brokers = shared.brokers

RESET = "share.auto.offset.reset"
LOCK = "share.record.lock.duration.ms"


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    group = GroupCommit()
    group.start()
    yield group
    await group.stop()


def open_store(directory: Path, commit: GroupCommit) -> MetadataStore:
    return MetadataStore(directory, commit)


def test_replay_sets_and_deletes_a_group_config() -> None:
    state = ClusterState()
    state.replay({"type": "group_config", "group": "g", "name": RESET, "value": "earliest"})
    state.replay({"type": "group_config", "group": "g", "name": LOCK, "value": "20000"})
    assert state.group_configs.config("g").auto_offset_reset.type == "earliest"
    assert state.group_configs.overrides("g") == {RESET: "earliest", LOCK: 20000}
    state.replay({"type": "group_config", "group": "g", "name": RESET, "value": None})
    assert state.group_configs.overrides("g") == {LOCK: 20000}
    assert state.group_configs.config("other").auto_offset_reset.type == "latest"


def test_records_are_validated_against_the_configs_now() -> None:
    state = ClusterState()
    [record] = state.group_configs_records("g", [AlterConfigOp(LOCK, SET, "20000")])
    assert record == {"type": "group_config", "group": "g", "name": LOCK, "value": "20000"}
    # Nothing changes until replayed.
    assert state.group_configs.overrides("g") == {}
    with pytest.raises(KafkaError) as bad:
        state.group_configs_records("g", [AlterConfigOp(LOCK, SET, "999")])
    assert bad.value.code == ErrorCode.invalid_config
    with pytest.raises(KafkaError) as bad:
        state.group_configs_records("g", [AlterConfigOp(RESET, SET, "LATEST")])
    assert bad.value.code == ErrorCode.invalid_config
    with pytest.raises(KafkaError) as bad:
        state.group_configs_records("", [AlterConfigOp(RESET, SET, "earliest")])
    assert bad.value.code == ErrorCode.invalid_request
    # Across keys: the session timeout above the heartbeat interval already stored.
    state.replay(
        {
            "type": "group_config",
            "group": "g",
            "name": "share.heartbeat.interval.ms",
            "value": "10000",
        }
    )
    state.group_configs.broker = ShareGroupBrokerConfig(
        min_session_timeout_ms=1000, min_heartbeat_interval_ms=1000
    )
    with pytest.raises(KafkaError) as bad:
        state.group_configs_records("g", [AlterConfigOp("share.session.timeout.ms", SET, "10000")])
    assert bad.value.code == ErrorCode.invalid_config


def test_one_compaction_key_per_group_and_config_a_deletion_its_tombstone() -> None:
    set_ = {"type": "group_config", "group": "g", "name": RESET, "value": "earliest"}
    gone = {"type": "group_config", "group": "g", "name": RESET, "value": None}
    other = {"type": "group_config", "group": "h", "name": RESET, "value": "earliest"}
    [(key, value)] = _encode(set_)
    assert _compaction_keys(key, value) == [(("group_config", "g", RESET), False)]
    [(key, value)] = _encode(gone)
    assert _compaction_keys(key, value) == [(("group_config", "g", RESET), True)]
    [(key2, value2)] = _encode(other)
    assert _compaction_keys(key2, value2)[0][0] != ("group_config", "g", RESET)
    assert key != key2


async def test_altered_configs_survive_a_restart_and_validate_only_writes_nothing(
    tmp_path: Path, commit: GroupCommit
) -> None:
    store = open_store(tmp_path / "meta", commit)
    await store.alter_group_configs("g", [AlterConfigOp(RESET, SET, "earliest")], False)
    await store.alter_group_configs("g", [AlterConfigOp(LOCK, SET, "20000")], False)
    end = store.runtime.record_log.end_offset
    await store.alter_group_configs("g", [AlterConfigOp(LOCK, SET, "25000")], True)
    assert store.runtime.record_log.end_offset == end
    assert store.state.group_configs.config("g").record_lock_duration_ms == 20000
    with pytest.raises(KafkaError) as bad:
        await store.alter_group_configs("g", [AlterConfigOp(LOCK, SET, "x")], False)
    assert bad.value.code == ErrorCode.invalid_config
    await store.alter_group_configs("g", [AlterConfigOp(LOCK, DELETE)], False)
    store.close()
    restarted = open_store(tmp_path / "meta", commit)
    assert restarted.state.group_configs.overrides("g") == {RESET: "earliest"}
    [entry] = restarted.state.group_configs.describe("g", [RESET])
    assert (entry.value, entry.source) == ("earliest", GROUP_CONFIG_SOURCE)
    restarted.close()


async def test_a_change_on_one_broker_is_seen_by_the_others_as_they_follow(
    brokers: Callable[[str], MetadataStore],
) -> None:
    a, b, c = brokers("a"), brokers("b"), brokers("c")
    await b.alter_group_configs("g", [AlterConfigOp(RESET, SET, "earliest")], False)
    assert a.state.group_configs.config("g").auto_offset_reset.type == "latest"
    await a.catch_up()
    assert a.state.group_configs.config("g").auto_offset_reset.type == "earliest"
    # Two brokers altering keys of one group at once: each is checked against the
    # other's and both keep theirs (one is refused, catches up and runs again).
    await asyncio.gather(
        a.alter_group_configs("g", [AlterConfigOp(LOCK, SET, "20000")], False),
        c.alter_group_configs("g", [AlterConfigOp("share.delivery.count.limit", SET, "3")], False),
    )
    for store in (a, b, c):
        await store.catch_up()
        assert store.state.group_configs.overrides("g") == {
            RESET: "earliest",
            LOCK: 20000,
            "share.delivery.count.limit": 3,
        }


async def test_groups_log_configs_are_adopted_once_and_the_metadata_wins(
    tmp_path: Path, commit: GroupCommit
) -> None:
    legacy = GroupConfigStore()
    legacy.replay(GroupConfigRecord("g", RESET, "earliest"))
    legacy.replay(GroupConfigRecord("g", LOCK, "20000"))
    legacy.replay(GroupConfigRecord("h", "share.isolation.level", "read_committed"))
    store = open_store(tmp_path / "meta", commit)
    await store.alter_group_configs("g", [AlterConfigOp(LOCK, SET, "40000")], False)
    assert await store.adopt_group_configs(legacy) == 2
    assert store.state.group_configs.overrides("g") == {RESET: "earliest", LOCK: 40000}
    assert store.state.group_configs.overrides("h") == {"share.isolation.level": "read_committed"}
    # Once: a later change in the metadata is never undone by the groups log's copy.
    await store.alter_group_configs("g", [AlterConfigOp(RESET, DELETE)], False)
    end = store.runtime.record_log.end_offset
    assert await store.adopt_group_configs(legacy) == 0
    assert store.runtime.record_log.end_offset == end
    store.close()
    restarted = open_store(tmp_path / "meta", commit)
    assert restarted.state.group_configs_adopted
    assert await restarted.adopt_group_configs(legacy) == 0
    assert restarted.state.group_configs.overrides("g") == {LOCK: 40000}
    restarted.close()


async def test_nothing_to_adopt_writes_nothing(tmp_path: Path, commit: GroupCommit) -> None:
    store = open_store(tmp_path / "meta", commit)
    end = store.runtime.record_log.end_offset
    assert await store.adopt_group_configs(GroupConfigStore()) == 0
    assert store.runtime.record_log.end_offset == end
    assert not store.state.group_configs_adopted
    store.close()


def _meta(*records: dict[str, object]) -> list[tuple[bytes | None, bytes | None]]:
    return [kv for r in records for kv in _encode(r)]


def _legacy(group: str, value: str) -> list[tuple[bytes | None, bytes | None]]:
    return list(group_records.encode(GroupConfigRecord(group, GROUP_LIMIT_KEY, value)))


def test_the_audit_reads_group_limits_from_the_metadata_over_the_groups_log() -> None:
    def limits(meta: list[tuple[bytes | None, bytes | None]]) -> dict[str, int]:
        groups = _legacy("old", "4") + _legacy("both", "4")
        return build_context(meta, groups, lambda _n, _p: (0, 0)).group_limits

    limit = {"type": "group_config", "group": "both", "name": GROUP_LIMIT_KEY, "value": "3"}
    new = {"type": "group_config", "group": "new", "name": GROUP_LIMIT_KEY, "value": "2"}
    assert limits(_meta(limit, new)) == {"old": 4, "both": 3, "new": 2}
    # Adopted: the groups log's are ignored, the metadata's deletions hold.
    gone = {**limit, "value": None}
    assert limits(_meta(limit, {"type": "group_configs_adopted"}, gone)) == {}
