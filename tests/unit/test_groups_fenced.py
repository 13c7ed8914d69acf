"""The group coordinator whose groups log another broker claimed (a write refused as
`persister.storage.Fenced`): it unloads its groups and answers NOT_COORDINATOR to
heartbeats, describes and offset reads from then on, as a coordinator that moved."""

from __future__ import annotations

import uuid

import pytest

from coordinator.assignor import TopicMetadata
from coordinator.group_config import GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.share_persister import InMemoryPersister
from persister.clock import ManualClock
from persister.coordinator_log import MemoryRecordLog
from persister.storage import Fenced
from protocol.errors import ErrorCode, KafkaError

T1 = uuid.UUID(int=1)
TOPICS = {T1: TopicMetadata(T1, "t1", 2)}


class ClaimedLog(MemoryRecordLog):
    claimed = False

    async def sync(self) -> None:
        if self.claimed:
            raise Fenced("groups", 2)


async def test_a_fenced_group_coordinator_unloads_and_answers_not_coordinator() -> None:
    record_log = ClaimedLog()
    groups = GroupCoordinator(
        InMemoryPersister(), lambda: TOPICS, GroupConfigStore(), record_log, clock=ManualClock()
    )
    groups.load()
    await groups.heartbeat("g", "m1", 0, ["t1"], None, "c", "/127.0.0.1")
    assert groups.describe("g").group_id == "g"
    written = len(record_log.records)

    record_log.claimed = True
    for member in ("m2", "m3"):  # the refused write, then a refusal without one
        with pytest.raises(KafkaError) as refused:
            await groups.heartbeat("g", member, 0, ["t1"], None, "c", "/127.0.0.1")
        assert refused.value.code == ErrorCode.not_coordinator
    assert len(record_log.records) == written
    assert groups.groups == {} and groups.list_groups() == []
    with pytest.raises(KafkaError) as described:
        groups.describe("g")
    assert described.value.code == ErrorCode.not_coordinator
    with pytest.raises(KafkaError) as offsets:
        await groups.describe_offsets("g", None, lambda _t, _p: 0)
    assert offsets.value.code == ErrorCode.not_coordinator
    await groups.stop()
    groups.close()
